"""What MariaDB's formats mean, shared by the parts that read them: column type codes, binlog
event kinds, character sets (with the byte maps read from the server, charmaps.json.gz), and
reading a connection's socket past pymysql's packet reader (receive.py)."""
