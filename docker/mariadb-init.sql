-- Run once by the MariaDB image on a new data directory (docker/compose.yaml): the account
-- the CDC service replicates with, and a sample table for the Spark mirror to follow.
CREATE USER 'cdc'@'%' IDENTIFIED BY 'cdcpass';
GRANT REPLICATION SLAVE, BINLOG MONITOR, SELECT ON *.* TO 'cdc'@'%';
CREATE TABLE shop.orders (
  id INT AUTO_INCREMENT PRIMARY KEY,
  customer_id INT NOT NULL,
  amount DECIMAL(10,2) NOT NULL,
  placed DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
);
INSERT INTO shop.orders (customer_id, amount) VALUES (1, 19.90), (2, 5.00), (1, 120.00);
