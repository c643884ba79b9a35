"""What every family of tools shares: errors and the CLI wrapper (errors, cli), progress lines (progress), the one
subprocess helper with timeouts (proc), git (git), this repository's root and HEAD (repo) and the one env-file
parser (envfile). Family code lives in scripts/series, scripts/host and scripts/bench."""
