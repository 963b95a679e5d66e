"""The sans-I/O core: pure functions and values that never await, read no clock and
touch no socket; time and outcomes come in as arguments, decisions go out as values."""
