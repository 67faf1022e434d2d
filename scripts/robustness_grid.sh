#!/usr/bin/env bash
# The robustness grid of BENCHMARKS.md section 11 (issue 19): on one .npz in medmnist's layout, for each
# network and normalisation, the Dirichlet loss as published (`paper`) against the confidence-normalised
# one (`normalized`, cap 20), each with its rate tuned on the validation split (never the test split),
# central and federated non-IID (beta 0.3) over 10 clients, eps 1 at delta 1e-5, 3 seeds,
# beside the non-private run of the same network. One study folder per (network, loss) under OUT.
#   bash scripts/robustness_grid.sh DATA.npz OUT [extra study flags, e.g. --resume]
set -euo pipefail
DATA=${1:?usage: robustness_grid.sh DATA.npz OUT [study flags]}
OUT=${2:?usage: robustness_grid.sh DATA.npz OUT [study flags]}
shift 2
STUDY=(dirichlet-fl study --data-path "$DATA" --betas central,0.3 --epsilons 1 --seeds 3 --batch-size 32 --workers 2)
for network in "lenet none" "lenet group" "cnn default"; do
  read -r model norm <<< "$network"
  name="$model-$norm"
  "${STUDY[@]}" --model "$model" --norm "$norm" --mechanisms none,dirichlet --dirichlet-weighting normalized \
    --out "$OUT/$name-normalized" "$@"
  "${STUDY[@]}" --model "$model" --norm "$norm" --mechanisms dirichlet --dirichlet-weighting paper \
    --out "$OUT/$name-paper" "$@"
done
