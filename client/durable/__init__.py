"""What a client keeps on disk across rounds and runs, and cannot lose: the lifetime ledger
(lifetime_ledger), the run's per-client state (run_state_file), the locked JSON file both rest on
(locked_json), the site's node secret (secret_store), and the one interface over the places a client's
ledger lives (stores: saved, reserve, commit)."""
