"""The offline demo crawl: real photos that ship inside installed packages, generated variants and bad files, and the demo's config."""
