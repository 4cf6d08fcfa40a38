"""The `ps` strategy: parameter servers (colocated or dedicated processes), TicTac-ordered pulls, SSP/ASP."""
