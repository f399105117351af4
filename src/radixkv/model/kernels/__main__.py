"""`python -m radixkv.model.kernels`: build the C++ CPU kernels now (install.sh runs it), so that
the first `radixkv serve` / `demo` does not wait for the compiler; `--default-model` also converts
the embedded default model, `--model NAME` an embedded model by short name (e.g. gemma3-270m).
Prints where the build landed and how long each step took."""

from __future__ import annotations

import argparse
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m radixkv.model.kernels", description=__doc__)
    parser.add_argument("--default-model", action="store_true", help="also convert the model")
    parser.add_argument(
        "--model", action="append", default=[], help="also convert this embedded model (short name)"
    )
    args = parser.parse_args(argv)
    from radixkv.model.checkpoints.embedded import EMBEDDED_MODELS

    for name in args.model:
        if name not in EMBEDDED_MODELS:
            parser.error(f"--model {name!r}: not an embedded model ({', '.join(EMBEDDED_MODELS)})")
    from radixkv.model.kernels import build_dir, cpu_kernels

    t0 = time.perf_counter()
    print(f"building the C++ CPU kernels in {build_dir()} ...", flush=True)
    module = cpu_kernels()
    if module is None:
        print("the C++ kernels could not be built here; torch's kernels will serve (see above)")
    else:
        print(f"kernels ready in {time.perf_counter() - t0:.0f} s", flush=True)
    if args.default_model:
        from radixkv.model.checkpoints.default import default_model_path

        t1 = time.perf_counter()
        print("converting the embedded default model ...", flush=True)
        path = default_model_path()
        print(f"default model ready in {time.perf_counter() - t1:.0f} s: {path}", flush=True)
    for name in args.model:
        from radixkv.model.checkpoints.embedded import resolve_model

        t1 = time.perf_counter()
        print(f"converting the embedded model {name} ...", flush=True)
        path = resolve_model(name)
        print(f"{name} ready in {time.perf_counter() - t1:.0f} s: {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
