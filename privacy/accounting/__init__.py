"""Privacy accounting: Theorem 10's pure analysis (analysis: eps(r), its floor, r*), the small stateful
per-client accountant (accountant), a site's lifetime budget across runs (lifetime) and client-level DP's
Gaussian accounting (client_level). The derivations: docs/privacy.md."""
