"""What every family of tools shares: errors and the CLI wrapper, progress lines, the one subprocess helper (proc),
git, this repository's root and HEAD (repo), HTTP, the TOML reader, the markdown table, Kimi-K2.5's shapes."""
