"""make report and make docs: receipt, receipt_data, share, profile; cost_model and spec_model (they read receipts)."""
