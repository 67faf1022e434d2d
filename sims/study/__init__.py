"""`dirichlet-fl study`: a sweep over how non-IID the split is, eps, the mechanism and seeds.

plan.py fixes the grid and checks it before any training, cell.py runs one cell (sims.fedavg_loop,
the app's arithmetic without the Flower engine), runner.py runs the grid with --resume and progress,
report.py writes table.md and the pictures, data_file.py checks a --data-path file (docs/study.md).
"""
