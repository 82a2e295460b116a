"""The disk-fault campaign: the storage engine under injected I/O errors (issue 46); see
:mod:`bkspark.testing.diskfaults.campaign`."""
