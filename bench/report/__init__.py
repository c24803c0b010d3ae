"""The results page from the results store: `python -m bench.report` renders docs/results.md and its figures from
bench/results/manifest.toml, `python -m bench.report check` validates the manifest against the JSON it names,
`python -m bench.report add RUN.json ...` files a new run under its canonical name and appends its manifest row
(bench/README.md, "The results store")."""
