"""How every page is written: one Jinja2 environment over templates/, the formats of numbers, intervals
and p-values, and markdown tables."""
