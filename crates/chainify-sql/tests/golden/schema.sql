-- Smallbank (docs/design/overview.md §7) plus tables that exercise composite keys, unique
-- constraints, foreign keys with actions, decimal and text keys.
CREATE TABLE accounts (custid BIGINT PRIMARY KEY, name VARCHAR(64) NOT NULL UNIQUE);
CREATE TABLE savings (custid BIGINT PRIMARY KEY REFERENCES accounts (custid), bal BIGINT NOT NULL);
CREATE TABLE checking (custid BIGINT PRIMARY KEY REFERENCES accounts (custid) ON DELETE CASCADE, bal BIGINT NOT NULL);
CREATE TABLE orders (region INT NOT NULL, id BIGINT NOT NULL, custid BIGINT REFERENCES accounts (custid),
                     code TEXT NOT NULL, PRIMARY KEY (region, id), UNIQUE (code));
CREATE TABLE order_lines (region INT NOT NULL, id BIGINT NOT NULL, line INT NOT NULL, qty INT NOT NULL,
                          PRIMARY KEY (region, id, line),
                          FOREIGN KEY (region, id) REFERENCES orders (region, id) ON DELETE CASCADE);
CREATE TABLE prices (sku TEXT PRIMARY KEY, price DECIMAL(12, 2) NOT NULL);
CREATE TABLE rates (rate DECIMAL(6, 3) PRIMARY KEY, label TEXT);
CREATE TABLE audit_log (msg TEXT);
