"""The `ps` strategy: parameter servers colocated with the workers, TicTac-ordered pulls, SSP/ASP."""
