"""Reports: HTML capacity-review reports and deployable configs."""
