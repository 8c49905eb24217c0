"""The watermark stage: its three methods, the OCR rule's evidence and score, and the generated marks it is tuned and measured on."""
