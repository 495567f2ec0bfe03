"""`coevolve run`: the whole loop on one machine, from a preset."""
