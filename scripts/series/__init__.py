"""The patch series: the pin, the upstream base, applying and exporting, the lint.

Verbs: apply, export, check_patches, refresh, prove_tests (python -m scripts.series.<verb>; make apply, export,
check-patches, refresh, prove-tests). Library: pin (patches/pin.toml), pin_copies (the Dockerfile's copy of it),
upstream (the pristine base tree), patchfile (one patch file), headers (README "Patch headers"), patching (apply
to a checkout or an installed package), record (sglang/_patchset.json), sglang_pkg (the one sglang locator: which
sglang an interpreter imports and its record), exporting (commits -> patches/), lint.
"""
