"""Carry the real models to the GPU machine, whose device calls take a working tree of at most 64 MiB and whose
transformers (5.17) builds Gemma 3's tokenizer wrongly from the GGUF.

Here (the development machine, models installed by `make install-gemma`):
    python -m bench.device_models pack .gguf
writes .gguf/gemma.partNN and .gguf/smol.partNN (45 MiB each: one part plus the tree fits a call) and
.gguf/gemma_tok.tgz (the tokenizer this machine's transformers saved for the Gemma GGUF), and prints the calls.
There (one device call per part, each copying its part to MODEL_DIR, /root by default; the first call also starts
the plan, whose steps `wait_file MODEL_DIR/gemma_ready` or `smol_ready`), after a model's last part:
    cd DIR/tree && PYTHONPATH=/tmp/site:$PWD python3 -m bench.device_models join /root gemma
run detached (setsid) from the plan's own tree, with the plan's wheels (gguf) on the path: joins that model's parts,
converts the Gemma GGUF into MODEL_DIR/cache with the carried tokenizer (`--model-cache-dir MODEL_DIR/cache`) and
touches MODEL_DIR/NAME_ready.
"""

from __future__ import annotations

import argparse
import tarfile
from pathlib import Path

MODELS = ("smol", "gemma")
PART_BYTES = 45 << 20


def pack(out: Path) -> None:
    from infinitehip.model.builtin import embedded_model_path, gemma3_270m_path
    from infinitehip.model.gguf_convert import convert_gguf, default_cache_root

    out.mkdir(parents=True, exist_ok=True)
    for name, path in (("gemma", gemma3_270m_path()), ("smol", embedded_model_path())):
        data = path.read_bytes()
        for i in range(0, len(data), PART_BYTES):
            (out / f"{name}.part{i // PART_BYTES:02d}").write_bytes(data[i : i + PART_BYTES])
    converted = convert_gguf(gemma3_270m_path(), default_cache_root())  # the user cache: no work once converted
    with tarfile.open(out / "gemma_tok.tgz", "w:gz") as tar:
        for f in converted.iterdir():
            if f.name.startswith("tokenizer"):
                tar.add(f, arcname=f.name)
    for part in sorted(out.glob("*.part*")):
        print(f"carry {part} -> cp {part} MODEL_DIR/")
    print(f"with the last Gemma part carry {out}/gemma_tok.tgz; after a model's last part: "
          "python3 -m bench.device_models join MODEL_DIR NAME")


def join(model_dir: Path, names: list[str]) -> None:
    from infinitehip.model.gguf_convert import convert_gguf

    for name in names:
        parts = sorted(model_dir.glob(f"{name}.part*"))
        if not parts:
            raise FileNotFoundError(f"no {name}.partNN in {model_dir}")
        target = model_dir / f"{name}.gguf"
        with open(target, "wb") as f:
            for part in parts:
                f.write(part.read_bytes())
        if name == "gemma":
            tok = model_dir / "gemma_tok"
            tok.mkdir(exist_ok=True)
            with tarfile.open(model_dir / "gemma_tok.tgz") as tar:
                tar.extractall(tok, filter="data")
            print("converted", convert_gguf(target, model_dir / "cache", tokenizer_dir=tok))
        (model_dir / f"{name}_ready").touch()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("action", choices=("pack", "join"))
    p.add_argument("dir", type=Path, help="pack: where the parts go (.gguf, git-ignored); join: MODEL_DIR")
    p.add_argument("models", nargs="*", help=f"join: the models to join, of {', '.join(MODELS)} (default: both)")
    args = p.parse_args()
    if unknown := set(args.models) - set(MODELS):
        p.error(f"unknown models {sorted(unknown)}; known: {', '.join(MODELS)}")
    if args.action == "pack":
        pack(args.dir)
    else:
        join(args.dir, args.models or list(MODELS))


if __name__ == "__main__":
    main()
