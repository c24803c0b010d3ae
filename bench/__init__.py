"""infinitehip's benchmarks: one entry point, `python -m bench SUITE ...` (bench/README.md lists the suites).

bench/ is outside the package: it imports the package's public APIs and is never imported by it.
common/ holds what every suite shares (flags, model loading, the JSON meta block, timing); suites/ one module per
suite, each with add_arguments(parser) and run(args, out).
"""
