"""`pdsvc status`: what the service manager and the runtime's state files say about a rendered
deployment, judged against its plan."""
