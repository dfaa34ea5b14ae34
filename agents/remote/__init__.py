"""Remote GPU shares: the share tokens a GPU node's remote server accepts (preload/remote/)."""
