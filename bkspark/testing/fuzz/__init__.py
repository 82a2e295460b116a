"""Coverage-guided fuzzing of the bookie's parsers (issue 49): atheris drives libFuzzer over

* ``add_batch``: an ``AddBatch`` message as a bookie takes it from either stream -- the C walk
  (``_native.scan_add_batch``), the C parse-validate-store (``Store.add_batch``) and the C
  refusal path (``_native.answer_adds``); what the walk accepts must parse as protobuf with
  as many adds, and every answer must hold one response per add;
* ``data_port``: the bytes a peer sends after its hello, served by the data port's connection
  loop (frames, add batches, range reads) over a real storage engine;
* ``journal``: the bytes of a journal file, replayed when the engine opens, then every
  entry read back;
* ``entry_log``: the bytes of an entry log or of its per-log index, under an index that
  points into it, then every entry read, and compaction run.

Each target ends in an error the engine or the bookie names (BKError, FrameError, a protobuf
decode error, OSError) or in success. Anything else -- another exception, a crash, a report
of AddressSanitizer or UndefinedBehaviorSanitizer on the C extension built for fuzzing
(:mod:`.build`) -- is a finding; libFuzzer writes the input to ``crash-*`` and exits non-zero.

Run one: ``python -m bkspark.testing.fuzz TARGET [--native SO] [libFuzzer flags] [corpus]``
(tests/fuzz runs each for a bounded time on its seed corpus in tests/fuzz/corpus/TARGET).
"""
TARGETS = ("add_batch", "data_port", "journal", "entry_log")
