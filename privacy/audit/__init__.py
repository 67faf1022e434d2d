"""The membership-inference audit, one module per concept (scores: HIGHER = more member-like).

statistics   Clopper-Pearson intervals, the split-half eps lower bound, AUC and ROC; CONFIDENCE
report       AuditReport: one audit of one set of candidates against its claim
attacks      the scores: loss, offline LiRA, offline RMIA
one_run      one-run auditing (Steinke et al. 2023): ONE_RUN_FRACTIONS and the one Bonferroni bound
update_view  canary cosines of model updates and the Gaussian eps estimate (Andrew et al. 2024)
verdict      violation / no violation / inconclusive at matched utility
"""
