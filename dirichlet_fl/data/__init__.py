"""Data: the loaders of every data set (loaders), the tensors they give (image_data), a site's .npz data
file (data_file), generated clients (synthetic), non-IID partitions (partition), the federated split with
its validation and test parts (split), and GPU augmentation (augmentation)."""
