"""A module the executors cannot import: its functions are pickled by reference."""


def triple(x):
    return 3 * x
