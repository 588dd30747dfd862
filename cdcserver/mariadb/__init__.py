"""What MariaDB's formats mean, shared by the parts that read them: column type codes, binlog
event kinds, and character sets (with the byte maps read from the server, charmaps.json.gz)."""
