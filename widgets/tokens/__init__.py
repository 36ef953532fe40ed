"""The token view: a reply shown token by token, with probabilities and alternatives where known, and diffs."""
