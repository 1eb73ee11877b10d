"""Reaching a deployment: Pulumi stack outputs, the Compute API, IAP ssh, and configs generated from outputs.
Imports only the core modules (serving, client, facts, images), never measure/ or observe/."""
