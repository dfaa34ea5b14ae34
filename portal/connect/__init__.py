"""Connect: the portal proxies HTTP and WebSockets to the app a reservation declares (Jupyter,
VS Code server, TensorBoard or a port) under its own origin, at /connect/<reservation id>/.

kinds.py: the apps and their default ports (read by the models, so it imports no models);
access.py: who may connect, the app's token and the pod environment that carries it;
proxy.py: the ASGI proxy (Daphne serves it: portal/asgi.py routes /connect/ there)."""
