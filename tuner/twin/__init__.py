"""The twin as the search and capacity use it: on the simulated engine's virtual clock."""
