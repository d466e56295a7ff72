"""The relay loop: worker, batches and their verdicts, ordering policy, retries, leader. Knows no
driver.
"""
