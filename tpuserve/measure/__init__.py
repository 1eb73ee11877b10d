"""Reading results or a server, never deploying: bench, report, cost, plan, probe. Imports core and deploy/."""
