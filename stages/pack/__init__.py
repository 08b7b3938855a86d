"""The pack stage: padding-free execution of padded BERT-family sequence models.

:mod:`stages.pack.stage` holds the record; :mod:`stages.pack.packed` the packed module,
:mod:`stages.pack.layout` the packing step (sequence starts on the host, the layout on
the device), :mod:`stages.pack.deploy` the deployable callable (token id lists in, embeddings
out), :mod:`stages.pack.attention` the variable-length attention kernels,
:mod:`stages.pack.bert` what a packable model is and :mod:`stages.pack.buckets` the
total-token buckets for static shapes.
"""
