"""The one thing pyproject.toml cannot say: kts's C extension.

``kts_resources.kafka._batch_tally`` is the inventory's CRC-checked batch walk in C
(records.walk_v2_batches). It is optional: where no compiler or Python headers are at hand the
install goes on without it and records.py walks the batches in Python, with the same results.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "kts_resources.kafka._batch_tally",
            sources=["kts_resources/kafka/_batch_tally.c"],
            extra_compile_args=["-O3"],
            optional=True,
        )
    ]
)
