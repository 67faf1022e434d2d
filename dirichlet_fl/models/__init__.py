"""Models: the networks (networks, torch), and the torch-free name tables a command line checks without
importing torch: norm layers (norms) and each network's measured training recipe (recipes). run_model
builds the model a run trains."""
