"""The README and the documentation site: examples that run, pages that stay true."""
