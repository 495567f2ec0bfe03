"""The Faust signal worker: agents that read a table, call streams.rules, write back and emit."""
