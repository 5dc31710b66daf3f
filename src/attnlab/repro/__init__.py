"""Reproduce and check every claim of the two source articles (sources.ARTICLES: A and B, cited by title)."""
