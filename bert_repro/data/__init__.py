"""Stage 2, the data: corpora (`corpus`, `sentences`), WordPiece vocabularies (`wordpiece`), the pre-training
examples of Google's reference builder (`pretraining_examples`), the same examples streamed (`streaming`), several
examples packed into one row (`pack_examples`) and a corpus packed to go with the code (`travel_corpus`)."""
