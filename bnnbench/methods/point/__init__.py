"""Point estimates and their sampling relatives: MAP (Adam on the log joint), SGD, MC dropout (Gal & Ghahramani,
2016)."""
