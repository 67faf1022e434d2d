"""`dirichlet-fl study` and its `bench accuracy` preset: a sweep over how non-IID the split is, eps,
the mechanism and seeds.

plan.py fixes the grid and checks it before any training, options.py reads it from the flags,
tuning.py tunes each rate not given on the validation split, cell.py runs one cell (sims.fedavg_loop,
the app's arithmetic without the Flower engine), runner.py runs the tuning runs and the cells with
--resume and progress, report.py writes table.md and the pictures, execute.py strings them together,
bench_preset.py maps `bench accuracy` onto it, data_file.py checks a --data-path file (docs/study.md).
"""
