"""Tooling for the SGLang EAGLE fast-verify patch series (one module per verb)."""
