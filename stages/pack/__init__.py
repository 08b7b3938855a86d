"""The pack stage: padding-free execution of padded BERT-family sequence models.

:mod:`stages.pack.stage` holds the record; :mod:`stages.pack.packed` the packed module,
:mod:`stages.pack.layout` the host-side packing step, :mod:`stages.pack.attention` the
variable-length attention kernels, :mod:`stages.pack.bert` what a packable model is and
:mod:`stages.pack.buckets` the total-token buckets for static shapes.
"""
