"""Model-level tools built on the API: diff, merge, quality scoring, protection (encrypt,
sign, verify whole files) and the text the CLI and the TUI both show."""
