"""The patch series: verbs apply, export, check_patches, refresh, prove_tests (docs/maintaining.md); libraries pin
(pin.toml, the series, patch set ids), base (the pristine base), am (git am into a tree), lint, sglang_pkg."""
