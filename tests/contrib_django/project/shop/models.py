from django.db import models


class Order(models.Model):
    item = models.CharField(max_length=100)
    shipped_by = models.IntegerField(null=True)  # the pid of the consumer that shipped it
