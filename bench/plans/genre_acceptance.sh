# The generalization acceptance's cells not yet on file (results.md, "Haystack genres against the generalization
# targets"), 30 prompts a cell (bench/plans/genre_cells.sh), in the order a short device session should take them:
# InfiniPot at 128K on the genres without its 30-prompt cell at today's defaults (~1.5 minutes a cell), then the
# 512K / 1M columns (~4 minutes a 1M cell on an H100 or H200): `long` takes the 1M cells not on file (tuning genres
# first) then every 512K cell; shakespeare's also re-measure the question kept in the last prefill chunk
# (docs/real-text.md, "The question split at a chunk boundary"). STEPS picks a share by name (default: those, in
# order); auto32k, tokenselect32k, rest128k, split128k and dictionary are on file (re-run them by name);
# calibration32k, infinitehip32k and tokenselect128k re-run cells on file; lines1m re-runs the 1M cells of
# catalogs, cmudict and code (on file for both methods since the chunk fix), which `long` leaves out. CORPORA must
# hold every genre a step names (`python -m bench.device_corpora pack .corpora`): the plan runs from the tree the
# starting call carried, so carry .corpora there, or, since every genre (~15 MB) and the model's first part exceed
# one call, set CORPORA=/root/corpora and copy .corpora there in the call that carries the model's last part,
# before the join (every cell waits for the joined model). Held-out genres are reported, never used to choose
# (bench/pick_setting.py refuses their files).
MODEL_DIR=${MODEL_DIR:-/root}
CORPORA=${CORPORA:-.corpora}
STEPS=${STEPS:-infinipot128k long}  # lines1m: both methods' cells on file
ALL="code licenses pydoc sotu essays cmudict catalogs shakespeare apispecs tables dictionary"
cells() { METHOD=$1; GENRES=$2; LENGTHS=$3; FLAGS=""; TAG=""; source bench/plans/genre_cells.sh; }
for step in $STEPS; do
  case $step in
    split128k) for m in infinitehip tokenselect; do cells $m "code tables apispecs" 131072; done ;;
    dictionary) for m in infinitehip tokenselect; do cells $m dictionary "32000 131072"; done ;;
    calibration32k) cells dense "licenses pydoc sotu essays cmudict catalogs shakespeare apispecs dictionary" 32000 ;;
    auto32k) cells auto "licenses pydoc sotu essays cmudict catalogs shakespeare" 32000 ;;
    infinitehip32k) cells infinitehip "$ALL" 32000 ;;
    tokenselect32k) cells tokenselect "$ALL" 32000 ;;
    tokenselect128k) cells tokenselect "code licenses pydoc apispecs tables" 131072 ;;
    rest128k) for m in infinitehip tokenselect; do cells $m "sotu essays cmudict catalogs shakespeare" 131072; done ;;
    infinipot128k) cells infinipot "essays cmudict catalogs shakespeare" 131072 ;;
    long) for m in infinitehip tokenselect; do cells $m "licenses pydoc sotu essays shakespeare apispecs tables dictionary" 1048576; done
          for m in infinitehip tokenselect; do cells $m "$ALL" 524288; done ;;
    lines1m) for m in infinitehip tokenselect; do cells $m "catalogs cmudict code" 1048576; done ;;
    *) echo "unknown step $step" >&2 ;;
  esac
done
