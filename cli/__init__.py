"""The roof: the `dirichlet-fl` command line. It may import every other package; nothing imports it."""
