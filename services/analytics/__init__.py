"""Training-dynamics analyses of the archive: tables, plots and the HTML report (`coevolve analyze`)."""
