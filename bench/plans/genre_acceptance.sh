# The generalization acceptance's missing cells (results.md, "Haystack genres against the generalization targets"),
# 30 prompts a cell (bench/plans/genre_cells.sh), in the order a short device session should take them: the cheap
# 32K columns first (dense's calibration and both selection methods: ~40 s a cell on an H200), then tokenselect at
# 128K again (its top-k breaks exact ties toward the lower index since 2026-12-04: the filed cells ran the old code),
# then 128K on the genres without a 30-prompt cell, InfiniPot at 128K on the rest, and last the 512K / 1M columns
# (~8 minutes a 1M cell). STEPS picks a share by name (default: all, in order). Held-out genres are reported, never
# used to choose (bench/pick_setting.py refuses their files).
MODEL_DIR=${MODEL_DIR:-/root}
CORPORA=${CORPORA:-.corpora}
STEPS=${STEPS:-calibration32k sparse32k tokenselect128k rest128k infinipot128k long}
ALL="code licenses pydoc sotu essays cmudict catalogs shakespeare apispecs tables"
cells() { METHOD=$1; GENRES=$2; LENGTHS=$3; FLAGS=""; TAG=""; source bench/plans/genre_cells.sh; }
for step in $STEPS; do
  case $step in
    calibration32k) cells dense "licenses pydoc sotu essays cmudict catalogs shakespeare apispecs" 32000 ;;
    sparse32k) for m in infinitehip tokenselect; do cells $m "$ALL" 32000; done ;;
    tokenselect128k) cells tokenselect "code licenses pydoc apispecs tables" 131072 ;;
    rest128k) for m in infinitehip tokenselect; do cells $m "sotu essays cmudict catalogs shakespeare" 131072; done ;;
    infinipot128k) cells infinipot "sotu essays cmudict catalogs shakespeare apispecs tables" 131072 ;;
    long) for m in infinitehip tokenselect; do cells $m "$ALL" "524288 1048576"; done ;;
    *) echo "unknown step $step" >&2 ;;
  esac
done
