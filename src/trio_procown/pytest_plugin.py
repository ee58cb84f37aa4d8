"""pytest plugin: fail tests that leak processes (placeholder, being built)."""
