"""`dirichlet-fl bench`: one module per benchmark, each a ratio to a baseline measured in the same run
(medians): accountant (r* solves), steps (a private step against a plain one), simulation (rounds through
Flower's engine), scale (virtual clients), secagg (SecAgg+'s cost). BENCHMARKS.md shows their results."""
