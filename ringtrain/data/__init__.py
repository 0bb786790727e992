"""Arrow datasets, token-budget batching and dataset preparation.

`open_dataset` memory-maps and validates a dataset, `BatchStream` turns it into this
rank's deterministic stream of packed batches (with padded views for the target), and
`write_synthetic_dataset` writes the learnable synthetic data of the default run.
"""

from ringtrain.data.batching import Batch, BatchStream, PaddedBatch
from ringtrain.data.dataset import TokenDataset, open_dataset
from ringtrain.data.errors import DatasetError
from ringtrain.data.synthetic import write_synthetic_dataset

__all__ = [
    "Batch",
    "BatchStream",
    "DatasetError",
    "PaddedBatch",
    "TokenDataset",
    "open_dataset",
    "write_synthetic_dataset",
]
