"""Shared core used by the verbs in scripts/ (pin, git, base, apply)."""
