BACKEND_ID = "XnnpackBackend"
