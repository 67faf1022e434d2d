#!/usr/bin/env bash
# The robustness grid of BENCHMARKS.md section 11.2 (issue 19). Every folder is one `dirichlet-fl study`
# (rates tuned on the validation split, never the test split; eps at delta 1e-5; 10 clients, 20 rounds of one
# local epoch, batch 32), named <data>-<network>-<loss>-w<warm-up rounds>[-eps<list>], under OUT.
#   bash scripts/robustness_grid.sh PART DATA OUT [extra study flags, e.g. --resume]
# PART:
#   networks  DATA = a .npz in medmnist's layout: lenet without norm, lenet with GroupNorm (2 channels per
#             group) and cnn, the normalised loss (with the non-private run) and the paper's, warm-up 0 and 3,
#             central and federated non-IID (beta 0.3; lenet without norm also IID), eps 1, 5 seeds
#   epsilons  DATA = the same file: the default (lenet, normalised, warm-up 3) at eps 0.5 and 4, 5 seeds
#   groups    DATA = the same file: lenet with GroupNorm of 8 channels per group, both losses, warm-up 3, 3 seeds
#   mnist     DATA = a folder with MNIST t10k's idx files (8,000 train / 2,000 test): BENCHMARKS section 4's
#             eps-1 and eps-4 Dirichlet cells (lenet, normalised, IID and beta 0.3, 3 seeds, the effective rate
#             0.05 it tuned on validation) with warm-up 3
#   lowrates  DATA = the same file: lenet with GroupNorm, normalised, warm-up 3, over the rates 0.005-0.02
#             (the networks part tuned it to its lowest rate, 0.02)
#   resnet9   DATA = the stand-in: resnet9 (GroupNorm), both losses, warm-up 3, central, one seed, rate 0.05 given
#             (not tuned: one resnet9 run costs about twenty of lenet's on a CPU core)
set -euo pipefail
PART=${1:?usage: robustness_grid.sh PART DATA OUT [study flags]}
DATA=${2:?usage: robustness_grid.sh PART DATA OUT [study flags]}
OUT=${3:?usage: robustness_grid.sh PART DATA OUT [study flags]}
shift 3
STUDY=(dirichlet-fl study --epsilons 1 --batch-size 32 --workers 2)
SOURCE=(--data-path "$DATA")
TAG=stand-in

EXTRA=("$@")

# run MODEL NORM LOSS WARMUP BETAS SEEDS [MECHANISMS]: one study folder; the normalised loss's folders
# also hold the non-private run of the same network and warm-up, which the table compares against
run() {
  local model=$1 norm=$2 loss=$3 warmup=$4 betas=$5 seeds=$6 mechanisms=${7:-}
  if [[ -z $mechanisms ]]; then
    mechanisms=dirichlet
    [[ $loss == normalized ]] && mechanisms=none,dirichlet
  fi
  local name="$TAG-$model-$norm-$loss-w$warmup$SUFFIX"
  "${STUDY[@]}" "${SOURCE[@]}" --model "$model" --norm "$norm" --dirichlet-weighting "$loss" \
    --warmup-rounds "$warmup" --betas "$betas" --seeds "$seeds" --mechanisms "$mechanisms" \
    --out "$OUT/$name" "${EXTRA[@]}"
}
SUFFIX=""
case $PART in
  networks)
    for warmup in 0 3; do
      run lenet none normalized "$warmup" central,iid,0.3 5
    done
    run lenet none paper 0 central,0.3 5
    for warmup in 0 3; do
      run lenet group normalized "$warmup" central,0.3 5
      run lenet group paper "$warmup" central,0.3 5
      run cnn default normalized "$warmup" central,0.3 5
    done
    run cnn default paper 0 central,0.3 5 ;;
  epsilons)
    STUDY=(dirichlet-fl study --epsilons 0.5,4 --batch-size 32 --workers 2)
    SUFFIX=-eps0.5-4
    run lenet none normalized 3 central,0.3 5 dirichlet ;;
  groups)
    run lenet group-8 normalized 3 central,0.3 3
    run lenet group-8 paper 3 central,0.3 3 ;;
  mnist)
    STUDY=(dirichlet-fl study --epsilons 1,4 --batch-size 32 --workers 2 --dirichlet-learning-rate 0.05)
    SOURCE=(--dataset mnist-idx --data-root "$DATA")
    TAG=mnist
    SUFFIX=-eps1-4
    run lenet none normalized 3 iid,0.3 3 dirichlet ;;
  lowrates)
    SUFFIX=-rates0.005-0.02
    EXTRA=(--rate-grid none=0.005/0.01/0.02,dirichlet=0.005/0.01/0.02 "${EXTRA[@]}")
    run lenet group normalized 3 central,0.3 5 ;;
  resnet9)
    STUDY=(dirichlet-fl study --epsilons 1 --batch-size 32 --workers 2 --learning-rate 0.05 \
      --dirichlet-learning-rate 0.05)
    run resnet9 default normalized 3 central 1
    run resnet9 default paper 3 central 1 ;;
  *) echo "robustness_grid.sh: PART=$PART is unknown; choose networks, epsilons, groups, mnist, lowrates or resnet9" >&2
     exit 2 ;;
esac
